"""What the harness and the vLLM servers it starts exchange: the environment variables that arm
the in-server plugins, the lines and files those plugins write and how they are read back, and
what a server's own log says it ran.

The in-server plugins (harness.serve.plugins, loaded by vLLM) write it; the harness (serve/
sets the variables, run/ and judge/ read the evidence) imports it from here, never a plugin
module. It sits at the bottom of the tree beside harness.core: the standard library and core
only, no vLLM, torch or numpy, so reading a server's evidence never loads what runs inside one.
"""
