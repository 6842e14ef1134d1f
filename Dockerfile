# syntax=docker/dockerfile:1
# mq-stream-gateway as a container: `docker compose up -d` (compose.yaml) builds it.
#
#   docker build -t mqgw .                        # the gateway (embedded queue manager,
#                                                 # kafka/mqtt/memory plugins)
#   docker build --target gateway-ibmmq -t mqgw-ibmmq .   # plus IBM's MQ client (profile ibmmq)
#
# Not built or run on the project's machines (they have no Docker engine); tests/test_compose.py
# checks this file's basics (non-root USER, HEALTHCHECK, no secrets) by parsing it.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# IBM MQ's developer image, the same one compose.yaml runs as the `ibmmq` service: the
# gateway-ibmmq target takes the MQ client libraries and headers from it.
ARG MQ_IMAGE=icr.io/ibm-messaging/mq:latest

# ---- build: a wheel of the project (no dev extras) -----------------------------------------
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY plugins ./plugins
COPY analytics ./analytics
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# ---- runtime base: non-root user, data volume, health check ---------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MQGW_DATA_DIR=/var/lib/mqgw
RUN groupadd --system --gid 10001 mqgw \
 && useradd --system --uid 10001 --gid mqgw --home-dir /var/lib/mqgw --shell /usr/sbin/nologin mqgw \
 && mkdir -p /var/lib/mqgw /etc/mqgw \
 && chown mqgw:mqgw /var/lib/mqgw
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# The embedded queue manager's queues (queue_manager.data_dir) and the broker's SQLite
# store (broker.store) live here: deploy/compose/gateway.yaml puts both under MQGW_DATA_DIR.
VOLUME ["/var/lib/mqgw"]
# /metrics and /healthz (the config's metrics.port; deploy/compose/gateway.yaml binds 0.0.0.0
# inside the container, compose.yaml publishes it on 127.0.0.1 only).
EXPOSE 9464
# /healthz answers 200 when healthy and 503 otherwise; MQGW_HEALTH_URL follows a changed port.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, sys, urllib.request; url = os.environ.get('MQGW_HEALTH_URL', 'http://127.0.0.1:9464/healthz'); sys.exit(0 if urllib.request.urlopen(url, timeout=4).status == 200 else 1)"]
WORKDIR /var/lib/mqgw
USER mqgw
ENTRYPOINT ["mqgw"]
CMD ["run", "--config", "/etc/mqgw/gateway.yaml"]

# ---- gateway-ibmmq: the same plus IBM's MQ client and the `mq` extra --------------------------
FROM ${MQ_IMAGE} AS mqclient

FROM ${PYTHON_IMAGE} AS build-ibmmq
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY --from=mqclient /opt/mqm /opt/mqm
RUN pip wheel --no-cache-dir --wheel-dir /wheels "ibmmq>=2.0"

FROM runtime AS gateway-ibmmq
USER root
COPY --from=mqclient /opt/mqm/lib64 /opt/mqm/lib64
COPY --from=mqclient /opt/mqm/gskit8 /opt/mqm/gskit8
COPY --from=build-ibmmq /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV LD_LIBRARY_PATH=/opt/mqm/lib64
USER mqgw

# ---- gateway (the default target) ------------------------------------------------------------
FROM runtime AS gateway
USER mqgw
