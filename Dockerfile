# One image for every stepledger service (projector, recovery, CLI jobs).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY src ./src
RUN pip install --no-cache-dir .
VOLUME ["/data"]
ENTRYPOINT []
CMD ["stepledger", "--help"]
