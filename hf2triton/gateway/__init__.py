"""The OpenAI-compatible gateway in front of tritonserver (app.py) and its process control (process.py)."""
