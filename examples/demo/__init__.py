"""``make demo``: the whole slice on one machine, with live progress and a summary.

Starts a local Kafka broker and Mosquitto (the devstack), an embedded queue manager with
the seed's streams (SYSTEM.BROKER.DEFAULT.STREAM, STOCK.STREAM, BULLETIN.STREAM) and the
gateway with its Kafka and MQTT plugins, then plays legacy MQ applications against it:

* an MQRFH tick feed publishing ``IBM/Latest`` and ``HPQ/Latest`` on STOCK.STREAM, naming
  the stream explicitly (``MQPSStreamName``), ticks ``SYMBOL PRICE VOLUME``; and an
  MQRFH2 publisher using the ``$SYS/STREAM/BULLETIN.STREAM/`` topic prefix;
* an MQRFH subscriber and an MQRFH2 subscriber of STOCK.STREAM;
* a Kafka consumer and an MQTT subscriber watching what the gateway bridges out;
* a Kafka producer and an MQTT publisher sending back into MQ;
* the analytics loop: once the ticks are in Kafka, ``mqgw analytics ohlc --once`` (Spark,
  a separate process) turns them into 1-minute bars on ``mqgw-analytics.ohlc``; the
  gateway's Kafka inbound publishes the bars on STOCK.STREAM as ``OHLC/1m/<SYMBOL>`` and
  an MQRFH subscriber (``OHLC/1m/*``, character wildcards) and an MQRFH2 subscriber
  (``$SYS/STREAM/STOCK.STREAM/OHLC/1m/+``, topic wildcards) receive them, checked against
  bars computed here from the ticks sent.

The ohlc job buckets ticks by MQMD PutDate/PutTime (``mq.putTime``). So that a short run
spans two one-minute windows, the tick feed stamps its own put times over the two whole
minutes before the run (MQPMO_SET_ALL_CONTEXT, as a feed handler replaying exchange
times does); docs/demo.md says so. It ends with a table (sent / received per path,
latency percentiles) and exits 0 only when every path delivered everything.

Not part of the installed package (``make demo`` runs it from the repository; its
client libraries come with the ``demo`` extra). Its modules, in reading order:
``paths`` (names and per-path counts), ``bars`` (ticks and the bars expected from them),
``legacy_apps`` (the MQRFH/MQRFH2 applications), ``modern_clients`` (Kafka and MQTT),
``ohlc_job`` (the Spark job as a process), ``exercise`` (the gateway and the run),
``summary`` (the table) and ``cli`` (``python -m examples.demo``).
"""
