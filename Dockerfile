# txstream: the coordinator (and every other `txstream` command) in one image.
#   docker build -t txstream:0.1.0 .
#   docker run --rm txstream:0.1.0            # the demo: embedded broker, coordinator, example
#   docker compose up                          # the demo on a real Apache Kafka (see compose)
#
# bookworm, not the moving python:3.11-slim: its OpenJDK 17 is the JRE Spark 4.2 is measured on.
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SPARK_LOCAL_IP=127.0.0.1

# procps: Spark's launch scripts call `ps`. The man directory: the JDK's post-install needs it.
# The JDK, not the JRE: its javac builds streaming/engine/local_fs.py's jar (no chmod process per
# checkpoint file, docs/decisions/0006-no-fork-local-fs.md).
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless procps \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# Dependencies first, in their own layer: a code change does not reinstall pyspark.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\\n'.join(p['dependencies'] + p['optional-dependencies']['coordinator'] + p['optional-dependencies']['console']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt
COPY . .
RUN pip install --no-deps . && rm -rf /src/build

# Not root; checkpoints on a volume the user owns.
RUN useradd --create-home --uid 10001 txstream \
 && mkdir -p /data/checkpoints \
 && chown -R txstream /data
USER txstream
# Built now, into the user's cache, so the first start does not wait for javac.
RUN python -c "from txstream.streaming.engine.local_fs import no_fork_fs_jar; assert no_fork_fs_jar()"
# And the driver's class-data archive: every start of the coordinator maps Spark's classes from
# it, seconds sooner (docs/decisions/0033-class-archive.md).
RUN python -m txstream.streaming.engine.class_archive
WORKDIR /data
# `txstream run` and `txstream pending` without --checkpoint-dir: on the volume.
ENV TXSTREAM_CHECKPOINT_DIR=/data/checkpoints/coordinator
VOLUME ["/data"]
# 9464: `txstream run --metrics-port 9464` (the embedded broker listens on loopback only)
EXPOSE 9464

ENTRYPOINT ["txstream"]
CMD ["demo"]
