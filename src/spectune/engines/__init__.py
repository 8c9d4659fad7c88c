"""The engines users deploy, one home each: how to launch one and check its health, the
flags or config spectune writes for it, its metrics dialect and its tuning grid.

- ``vllm``       vLLM's CPU build: its virtualenv (``setup``), its server (``server``), its
                 ``--speculative-config`` (``flags``), its ``/metrics`` (``metrics``), the
                 EAGLE-3 head export and spectune's proposer inside it.
- ``llamacpp``   llama.cpp's ``llama-server``: started and health-checked (``server``), its
                 flags (``flags``), its tuning grid and tuner (``tuning``), its ``/metrics``
                 (``metrics``).
- ``sglang``     SGLang's server flags (``flags``) and its ``/metrics`` (``metrics``).

What the engines share:

- ``names``      their spellings (``llamacpp``, also ``llama.cpp``).
- ``tuned``      a tuned setup, as read from a ``select`` or ``bench`` result file.
- ``drafts``     what a draft is to an engine (a kind), and the line that refuses one.
- ``plan``       a checked setup and the plan (flags, command, notes) a writer returns.
- ``export``     which engine writes what (``export``, ``export_best``, ``refusal``).
- ``metrics``    which engine's dialect reads an exposition (``read_exposition``).
- ``process``    a server process on a free loopback port: started, waited for, stopped.
- ``hf_folder``  a target written as a Hugging Face folder, the form vLLM loads.
- ``costs``      a deployment's measured step costs (the file ``watch --costs`` reads).
"""
