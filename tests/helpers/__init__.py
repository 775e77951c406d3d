"""What tests share: test modules import helpers from here, never from each other.
(tests/daemon.py, the daemon starter the service tests import, moves here with them.)"""
