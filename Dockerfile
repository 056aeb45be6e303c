# The effect-ledger services (effects worker, effects reconcile, ...), for docker-compose.yml.
# The image runs what a user installs: stage one builds the wheel from the source tree, stage two
# installs that wheel with the [processor,metrics] extras (never the source tree itself), at the dependency
# versions the tests ran with (constraints.txt).

FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY effect_ledger ./effect_ledger
COPY schemas ./schemas
COPY streams ./streams
COPY processors ./processors
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM python:3.11-slim
COPY --from=wheel /dist /dist
COPY constraints.txt /tmp/constraints.txt
RUN pip install --no-cache-dir -c /tmp/constraints.txt "$(ls /dist/effect_ledger_kafka-*.whl)[processor,metrics]" \
    && rm -rf /dist /tmp/constraints.txt \
    && useradd --create-home --uid 10001 effects \
    && mkdir /data && chown effects /data
# Not root. /data is where `effects worker --data-dir /data` keeps the table's RocksDB files; a
# named volume mounted there starts with this ownership.
USER effects
WORKDIR /home/effects
ENTRYPOINT ["effects"]
CMD ["--help"]
