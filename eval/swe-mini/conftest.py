"""The task repositories under repos/ hold their bugs on purpose; they are run by validate.py on copies,
never collected as part of Orchard's own test run."""

collect_ignore = ["repos", "validate.py"]
