"""What crosses a process or file boundary, defined once, for both sides to import.

- `environment`: every environment variable pdcheck sets on a server or reads;
- `plugin_files`: what the vLLM plugin leaves in its folder, and its injection records;
- `forkserver`: the messages between a launcher and the vLLM fork server;
- `records`: a records file's question records;
- `server_records`: the servers a run folder records (cell.json) and their KV counters;
- `vllm_names`: the few vLLM names pdcheck's processes outside vLLM need.

Import-light by design (the standard library and msgspec, which vLLM depends on too): the
vLLM plugin imports it inside every vLLM process, and the launcher before vLLM is imported.
Nothing here imports another pdcheck package.
"""
