"""What tests share: test modules import helpers from here, never from each other."""
