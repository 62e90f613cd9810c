"""The endpoints, one module per API family: its routes (an APIRouter named `router`) and its serving logic
(request -> Triton -> answer). The shapes they read and write are in gateway/protocol.py, the way to Triton in
gateway/backend.py, the checks every request passes in gateway/boundary.py, the SSE and JSON writing in
gateway/responses.py. A new endpoint is a module here and its router in app.py's ROUTERS."""
