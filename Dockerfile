# The gateway's image (docker-compose.yml). Built locally by stack/images.sh with podman:
# no registry is reachable here, so the base is Debian 12 made by debootstrap
# (localhost/isthmus-debian:bookworm; override with --build-arg BASE=...).
# Two stages: the virtualenv is built in the first (pip, venv); the runtime stage has only
# python3 and the copied venv + source: no compiler, no pip, no package caches.
ARG BASE=localhost/isthmus-debian:bookworm

FROM ${BASE} AS build
RUN apt-get update -q && apt-get install -y -q --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
# No index is used inside the build: stack/images.sh downloads the wheels on the host (where
# pip is configured) and mounts them at /wheels (podman build --volume).
ENV PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Dependencies first (their layer survives source edits), then the package itself, editable
# so that `isthmus migrate` finds /app/alembic.ini and /app/migrations.
COPY pyproject.toml ./
RUN python3 -m venv /opt/isthmus && mkdir -p gateway adapters && touch gateway/__init__.py adapters/__init__.py \
    && /opt/isthmus/bin/pip install -q . && /opt/isthmus/bin/pip uninstall -q -y isthmus \
    && rm -rf gateway adapters build *.egg-info
COPY alembic.ini ./
COPY gateway gateway
COPY adapters adapters
COPY migrations migrations
RUN /opt/isthmus/bin/pip install -q --no-deps -e . \
    && find /app /opt/isthmus -name __pycache__ -prune -exec rm -rf {} + \
    && /opt/isthmus/bin/python -m compileall -q /app/gateway /app/adapters /app/migrations \
    && /opt/isthmus/bin/python -m pip uninstall -q -y pip setuptools wheel

FROM ${BASE} AS runtime
RUN apt-get update -q && apt-get install -y -q --no-install-recommends python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
    && groupadd -g 10001 isthmus && useradd -r -u 10001 -g isthmus -d /app -s /usr/sbin/nologin isthmus
COPY --from=build /opt/isthmus /opt/isthmus
COPY --from=build /app /app
ENV PATH=/opt/isthmus/bin:$PATH PYTHONUNBUFFERED=1 ISTHMUS_PORT=8080
WORKDIR /app
USER 10001:10001
EXPOSE 8080
# /healthz: the process serves HTTP (docs/operations.md). Workers turn this off in compose.
HEALTHCHECK --interval=5s --timeout=3s --start-period=20s --retries=5 \
  CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('ISTHMUS_PORT', '8080'), timeout=3)"]
CMD ["sh", "-c", "exec isthmus serve --host 0.0.0.0 --port \"$ISTHMUS_PORT\" --no-migrate"]
