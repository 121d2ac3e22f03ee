"""What several recipes use: trajectories -> training examples (`examples.py`, each recorded call rendered
with the student's chat template by `call_render.py`), SmolLM2's tokenizer and a tiny random Qwen3 for tests
and CPU runs (`tiny_models.py`), and the embedded SmolLM2 exported as a model directory to train
(`smollm2_export.py`)."""
