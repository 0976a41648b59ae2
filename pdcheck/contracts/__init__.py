"""What crosses a process or file boundary, defined once, for both sides to import.

Import-light by design (the standard library and msgspec, which vLLM depends on too): the
vLLM plugin imports it inside every vLLM process, and the launcher before vLLM is imported.
Nothing here imports another pdcheck package.
"""
