"""Generated gRPC code for protos/decider/v1/decider.proto (scripts/gen_protos.sh)."""
