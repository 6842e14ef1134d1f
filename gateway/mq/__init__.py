"""Queue managers behind one async port (:mod:`gateway.mq.port`).

``gateway.mq.embedded`` is an in-process queue manager with IBM MQ's semantics on SQLite
(``qmgr`` the queue manager, ``connection``/``handle`` hconn and hobj, ``mqsc*`` the admin
language, ``channels``/``cluster``/``network`` networks of them; docs/embedded-qm.md);
``gateway.mq.ibmmq`` talks to IBM MQ through IBM's ``ibmmq`` package or pymqi.
Everything above this package uses only the port. ``MQError`` is the package's error root.
"""
