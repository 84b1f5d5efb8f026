# The HyperWatch service image (used by docker-compose.yml). The project depends on torch; the CPU
# wheel keeps the image small enough. hyperwatch/ links the top-level folders into one namespace.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

COPY pyproject.toml README.md ./
COPY hyperwatch ./hyperwatch
COPY hooks ./hooks
COPY monitor ./monitor
COPY trainer ./trainer
COPY web ./web
COPY migrations ./migrations
COPY configs ./configs
RUN pip install -e '.[server]' && useradd --create-home --uid 10001 hyperwatch

USER hyperwatch
EXPOSE 8000
CMD ["hyperwatch", "serve", "--host", "0.0.0.0", "--port", "8000"]
