"""``stepledger doctor``: read a cluster's topics and groups and say what is unsafe or off.

``checks``: pure judgements over what was read (no I/O); ``facts``: reading it from Kafka.
"""
