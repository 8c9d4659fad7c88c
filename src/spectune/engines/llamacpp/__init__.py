"""llama.cpp's ``llama-server``: everything spectune knows of it.

- ``server``   the binary found, started on a free port and health-checked; one request.
- ``flags``    a tuned setup as its flags (and its refusals); a draft folder as a GGUF.
- ``tuning``   its tuning grid, and the flags chosen by measuring them
               (``spectune tune --engine llamacpp``).
- ``metrics``  its ``/metrics`` dialect and each response's ``timings``.

The submodules are imported where used: this package's import loads nothing.
"""
