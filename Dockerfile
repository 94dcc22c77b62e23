# One image for the web server and the Celery worker (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app/platform:/app \
    DJANGO_SETTINGS_MODULE=ringside.settings \
    RUNS_DIR=/data/runs \
    RINGSIDE_VAR_DIR=/data/var

WORKDIR /app
# CPU wheels of torch keep the image small; on GPU hosts build with the CUDA index instead.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY engine engine
COPY bench bench
RUN pip install --no-cache-dir --extra-index-url "$TORCH_INDEX" -e . \
    && useradd --create-home ringside && mkdir -p /data && chown ringside /data
COPY platform platform
COPY frontend frontend
COPY manage.py ./

USER ringside
EXPOSE 8000
CMD ["sh", "-c", "python manage.py migrate --noinput && python manage.py ensure_admin && exec python manage.py web --host 0.0.0.0 --port 8000"]
