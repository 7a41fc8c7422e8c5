"""Generated gRPC stubs; edit proto/ and run `make proto` instead."""
