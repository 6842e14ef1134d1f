"""Stream union, provisioning and health (issue 13 items 5 and 6).

The gateway supports the union of its neighbours' streams plus its own serviced ones.
The seed names the two ways a badly provisioned broker loses a neighbour's publications:
a missing stream queue sends them to the dead-letter queue (MQDLH reason 2085), an
unserviced one lets them pile up. ``union`` says which streams must exist, ``observe``
looks at the queue manager, ``check`` turns both into a report (pure), ``repair`` defines
queues and replays the dead-lettered publications, ``migration`` records a legacy
broker's fixed stream set, ``health`` carries the facts to /healthz and /metrics and
``cli`` is ``mqgw streams check`` and ``mqgw migrate``.
"""
