"""Reading back what is already on Kafka, for the operator and the sink alike.

``bodies``: held half messages' bodies, read back from the half topic (which are gone, for the
operator; into the records it writes, for the sink). ``replay``: which batches may be replays,
and what a crashed run of one already wrote. ``release_index``: a predecessor checkpoint's
releases, read once per partition for every state key's look. The room stands on the Kafka
module and the base alone; the backwards reader its modules share is a Kafka mechanism the
console uses too (:mod:`txstream.kafka.read_back`). Nothing is imported here, so that an importer
takes only the module it needs (``release_index`` needs numpy, ``replay`` does not).
"""

__all__: list[str] = []
