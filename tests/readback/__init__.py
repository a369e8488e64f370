"""Reading back what is on Kafka (txstream/readback): held bodies, replays, a predecessor's
releases."""
