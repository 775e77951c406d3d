"""The `decider` commands, one module per group; decider/cli.py parses the flags and
dispatches to `cmd_<command>(args)`."""
