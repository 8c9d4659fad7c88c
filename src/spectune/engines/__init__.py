"""The engines users deploy, one home each: how to install and launch one, check its health,
and hand it a model it can load.

- ``process``    a server process on a free loopback port: started, waited for, stopped.
- ``hf_folder``  a target (GGUF or native folder) written as a Hugging Face folder, the form
                 vLLM loads, checked against spectune's own runtime.
- ``costs``      a deployment's measured step costs (the file ``watch --costs`` reads).
- ``vllm``       vLLM's CPU build: its own virtualenv, its server's command line and settings.
"""
