"""``mqgw network check``: one look at a whole network of brokers (docs/scaling.md
"Checking the network").

``view`` is what one node says about itself (its metrics listener's ``/network``),
``resolution`` follows MQ name resolution across those views, ``check`` judges them
(pure, synchronous), ``collect`` builds a running gateway's view, ``read`` fetches views
over HTTP and ``cli`` is the command.
"""
