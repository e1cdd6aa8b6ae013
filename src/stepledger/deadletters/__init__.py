"""Dead letters, one package: nothing is lost on bad input.

``letter``: a letter, cut to fit the producer's size limit, and its ``dlq_*`` headers;
``records``: where a consumer's refused records go (projector); ``events``: where a
given-up step or workflow goes (recovery, resume); ``readback``: reading the topic
back and replaying letters onto their original topic.
"""
