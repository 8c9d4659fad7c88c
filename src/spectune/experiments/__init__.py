"""Experiments behind the README's tree, batching and chunked-verification figures.

Each module measures one question and returns typed results; ``spectune experiment``
prints them and writes JSON. Numbers come from running the command, never from tests.
"""
