"""Code that runs on the user's machine: requests, runners, launchers, images, Docker.
Never imports torch."""
