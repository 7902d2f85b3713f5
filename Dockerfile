# Image for docker-compose.yml (not built in CI: no container engine on these machines).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml alembic.ini ./
COPY gateway gateway
COPY adapters adapters
COPY migrations migrations
RUN pip install --no-cache-dir . && useradd -r isthmus
USER isthmus
EXPOSE 8080
CMD ["isthmus", "serve", "--host", "0.0.0.0", "--port", "8080"]
