"""Measurements of the kit itself (the cost model against its runs, the cluster's cores,
the start-up against Horovod's example, what the step marks cost): each a `python -m`
command; nothing in the product imports them."""
