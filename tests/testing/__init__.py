"""The users' test kit (txstream/testing): its driver, and the example a user copies."""
