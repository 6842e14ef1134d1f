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
# IBM MQ's redistributable client (C libraries, TLS, and with genmqpkg's SDK option the
# headers the `ibmmq` package compiles against). The server image compose.yaml runs as
# `ibmmq` ships no /opt/mqm/inc, so the client is not taken from it. Override the version
# (VRMF) or the download location with --build-arg; only Linux x86-64 is published.
ARG MQ_REDIST_URL=https://public.dhe.ibm.com/ibmdl/export/pub/software/websphere/messaging/mqdev/redist
ARG MQ_VRMF=9.4.5.0
ARG MQ_ARCH=X64

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
FROM ${PYTHON_IMAGE} AS build-ibmmq
ARG MQ_REDIST_URL
ARG MQ_VRMF
ARG MQ_ARCH
# genmqpkg keeps the client runtime plus the SDK (inc/), TLS (gskit8) and message catalogues
ENV MQ_FILE_PATH=/opt/mqm \
    genmqpkg_incnls=1 \
    genmqpkg_incsdk=1 \
    genmqpkg_inctls=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
ADD ${MQ_REDIST_URL}/${MQ_VRMF}-IBM-MQC-Redist-Linux${MQ_ARCH}.tar.gz /tmp/mq-redist.tar.gz
RUN mkdir -p /opt/mqm \
 && tar -xzf /tmp/mq-redist.tar.gz -C /opt/mqm \
 && rm /tmp/mq-redist.tar.gz \
 && /opt/mqm/bin/genmqpkg.sh -b /opt/mqm \
 && test -f /opt/mqm/inc/cmqc.h
RUN pip wheel --no-cache-dir --wheel-dir /wheels "ibmmq>=2.0"
# what the runtime needs of the client: libraries, TLS, licences (no headers, no compiler)
RUN mkdir -p /mqm-runtime \
 && for d in lib64 gskit8 licenses; do \
      if [ -d "/opt/mqm/$d" ]; then cp -a "/opt/mqm/$d" /mqm-runtime/; fi; \
    done

FROM runtime AS gateway-ibmmq
USER root
COPY --from=build-ibmmq /mqm-runtime /opt/mqm
COPY --from=build-ibmmq /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV LD_LIBRARY_PATH=/opt/mqm/lib64
USER mqgw

# ---- gateway (the default target) ------------------------------------------------------------
FROM runtime AS gateway
USER mqgw
