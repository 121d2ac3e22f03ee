"""Task images built from a Dockerfile (a Harbor task's environment/Dockerfile): the build a task carries
(spec.py), the Dockerfiles the daemon-less builder takes (dockerfile.py), that builder (local.py), and the step
before a run or a validation that builds what its tasks need on the backend that runs them (prepare.py)."""
