# The effect-ledger services (effects worker, effects reconcile, ...), for docker-compose.yml.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY streams ./streams
COPY processors ./processors
RUN pip install --no-cache-dir .
ENTRYPOINT ["effects"]
