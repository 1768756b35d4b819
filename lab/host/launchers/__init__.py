"""The ranks' launchers on this machine, run as `python -m lab.host.launchers.local` (local
DDP) and `python -m lab.host.launchers.horovod` (horovodrun with its build checks answered
from the stack probe): standard library only, and nothing of the kit is imported before
they start the ranks (a launch's start-up is measured from here). The places build their
commands (lab.host.places.launch); nothing imports these modules."""
