"""The txstream command (txstream/streaming/cli): flags, defaults, the admin and shell commands,
the recovery demo's parts."""
