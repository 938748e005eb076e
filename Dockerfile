# thinkgate: the gateway image (`thinkgate serve`; the same image runs `thinkgate sim`,
# `thinkgate keys ...` and `thinkgate ledger ...` with `--entrypoint thinkgate`).
#
#   docker build -t thinkgate:0.1.0 .
#   docker run --read-only --tmpfs /tmp -v thinkgate-data:/var/lib/thinkgate -p 8080:8080 \
#       -e THINKGATE_UPSTREAMS=http://vllm:8000/v1 thinkgate:0.1.0
#
# Two stages: `builder` installs the hash-pinned dependencies (requirements/runtime.lock, made by
# `make lock`) and the project's own wheel into /opt/venv; the final stage copies that venv onto
# a clean base, so no compiler, pip cache or build tool reaches the image. Dependencies install
# as binary wheels only (`--only-binary=:all:`): a dependency without a wheel fails the build
# here instead of quietly needing gcc.
#
# Ledger keys. `thinkgate serve` refuses to start without THINKGATE_LEDGER_KEY_FILE and
# THINKGATE_SIGNING_KEY_FILE (only `--demo` makes its own). They are secrets: never bake them into
# an image or a layer. Either
#   - create them once in the data volume (idempotent: existing files are kept, and the ledger's
#     schema is migrated; deploy/compose/compose.yaml does this in its `ledger-init` service):
#       docker run --rm -v thinkgate-data:/var/lib/thinkgate \
#           -e THINKGATE_DATABASE_URL=... --entrypoint thinkgate thinkgate:0.1.0 ledger init
#   - or mount them read-only from a secret store (Docker/Compose secrets, a Kubernetes Secret
#     volume) and point the settings at the mounted files, e.g.
#       THINKGATE_LEDGER_KEY_FILE=/run/secrets/thinkgate-ledger-keys.json
#       THINKGATE_SIGNING_KEY_FILE=/run/secrets/thinkgate-signing-key.pem
#     (files readable by uid 10001, mode 0600 or 0400).
# Back both up: without the ledger keys no record can be decrypted, and without the signing key
# no new checkpoint verifies under the public key auditors pinned.
#
# Read-only root filesystem: everything thinkgate writes (SQLite database when no PostgreSQL is
# configured, the ledger spool, keys made by `ledger init`, the demo's key file) lives under the
# VOLUME /var/lib/thinkgate. `--workers N > 1` also needs a writable /tmp (prometheus-client's
# multiprocess directory): mount a tmpfs there, as above.
#
# Base images are pinned to an exact Python patch release; when bumping it, also bump
# LOCK_PYTHON in the Makefile and run `make lock` (tests/deploy/test_dockerfile.py checks the
# two agree). To pin by digest as well, append `@sha256:...` as printed by
# `docker buildx imagetools inspect python:<tag>`.

FROM python:3.11.15-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /src

# Dependencies first, so that editing the code does not reinstall them (layer cache).
# /opt/build holds the build backend (setuptools, hash-pinned as well) and never leaves this stage.
COPY requirements/runtime.lock requirements/build.lock requirements/
RUN python -m venv /opt/build \
    && /opt/build/bin/pip install --require-hashes --no-deps --only-binary=:all: \
        -r requirements/build.lock \
    && python -m venv /opt/venv \
    && /opt/venv/bin/pip install --require-hashes --no-deps --only-binary=:all: \
        -r requirements/runtime.lock

# The project itself, without dependencies (all of them came from the lock above) and without
# build isolation (which would fetch an unpinned setuptools). pip compiles every module to
# bytecode here, so the read-only image never needs to write a .pyc.
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY audit audit
COPY ratelimit ratelimit
COPY bench bench
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/wheels . \
    && /opt/venv/bin/pip install --no-deps --no-index /tmp/wheels/thinkgate-*.whl \
    && /opt/venv/bin/pip uninstall --yes pip


FROM python:3.11.15-slim-bookworm

LABEL org.opencontainers.image.title="thinkgate" \
      org.opencontainers.image.description="OpenAI-compatible streaming gateway for self-hosted reasoning models" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"

# Nothing is installed at run time, so the base image's pip and setuptools go too (fewer
# packages to patch). The service account gets a fixed uid/gid, so that volume and secret
# ownership can be set outside the image; its directories are created before the VOLUME line
# so that a fresh named volume starts with this ownership.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel \
    && groupadd --system --gid 10001 thinkgate \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /var/lib/thinkgate --shell /usr/sbin/nologin thinkgate \
    && install -d -o 10001 -g 10001 -m 0700 \
        /var/lib/thinkgate /var/lib/thinkgate/keys /var/lib/thinkgate/spool

COPY --from=builder /opt/venv /opt/venv

# Every default path points into the volume (the settings' own defaults are relative to the
# working directory, which is the volume as well).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    THINKGATE_HOST=0.0.0.0 \
    THINKGATE_PORT=8080 \
    THINKGATE_HOME=/var/lib/thinkgate \
    THINKGATE_DATABASE_URL=sqlite+aiosqlite:////var/lib/thinkgate/thinkgate.db \
    THINKGATE_LEDGER_KEY_FILE=/var/lib/thinkgate/keys/ledger-keys.json \
    THINKGATE_SIGNING_KEY_FILE=/var/lib/thinkgate/keys/signing-key.pem \
    THINKGATE_AUDIT_SPOOL_FILE=/var/lib/thinkgate/spool/ledger-spool.log

WORKDIR /var/lib/thinkgate
VOLUME ["/var/lib/thinkgate"]
USER 10001:10001
EXPOSE 8080

# /healthz answers while the process is alive (readiness is /readyz). Python's urllib, because
# the slim base has no curl; it exits non-zero on a refused connection or any non-2xx status.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('THINKGATE_PORT', '8080') + '/healthz', timeout=4)"]

ENTRYPOINT ["thinkgate", "serve"]
