"""The OpenAI-compatible gateway in front of tritonserver: app.py builds it (middleware, error handlers, routers),
api/ holds one module per API family (its routes and serving logic), protocol.py the request and answer shapes,
boundary.py the checks every request passes, backend.py the way to Triton, responses.py the JSON and SSE writing,
errors.py OpenAI's error object. process.py starts and stops it like tritonserver; checks.py is what `serve`
checks through it."""
