"""Byte-exact, sans-I/O codecs for IBM MQ message headers.

Modules (one structure or concept each): ``mqmd`` (MQMD v1/v2), ``rfh`` (MQRFH v1 and
NameValueStrings), ``rfh2`` (MQRFH2) with ``folder`` (its element trees), ``xqh``
(MQXQH + transmission-queue wrap/unwrap), ``mqmde`` (MQMDE), ``dlh`` (MQDLH + dead-letter
wrap/unwrap), ``pcf`` (PCF: MQCFH and its MQCFIN/MQCFST/MQCFSL parameters, for broker
administration publications), ``chain`` (walking/building header chains), ``put_time``
(PutDate/PutTime), ``ccsid`` (character sets), ``encoding`` (integer byte order),
``constants``/``formats`` (MQ constant families), ``reasons`` (MQRC/MQRCCF codes) and
``errors`` (``WireError``).

Pure functions over bytes: no I/O, no asyncio, no logging. Every decoder either returns
a value or raises :class:`gateway.wire.errors.WireError` carrying the MQ reason code.
See docs/wire-formats.md.
"""
