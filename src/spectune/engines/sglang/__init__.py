"""SGLang: what spectune writes for it and reads from it (spectune does not start SGLang:
its speculation runs on CUDA).

- ``flags``    a tuned setup as its server flags (and its refusals).
- ``metrics``  its ``/metrics`` dialect.
"""
