# The server of `make serve`, in a container: the embedded model (or a mounted folder) on port 8000.
#
#   docker build -t helios-jax .                                   # CPU (jax's CPU build)
#   docker build -t helios-jax --build-arg EXTRAS=cuda12 .         # NVIDIA GPU, CUDA 12 drivers
#   docker run --rm -p 8000:8000 helios-jax                        # the embedded model
#   docker run --rm --gpus all -p 8000:8000 -v /models/Qwen3-0.6B:/model \
#       -e HELIOS_API_KEY=secret helios-jax --model=/model --concurrency=16
#
# The command is `make serve`'s (`python -m helios_jax.serve`), listening on 0.0.0.0 rather than
# 127.0.0.1 so that the published port reaches it; arguments after the image name are more
# server flags (`--help` lists them). The key comes from the environment, never the command line.
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/cache/jax

WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY helios_jax ./helios_jax
COPY kernels ./kernels
COPY reference ./reference
RUN pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}" \
    && useradd --create-home --uid 1000 helios && mkdir -p /cache/jax && chown helios /cache/jax
USER helios

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s CMD \
    python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"
ENTRYPOINT ["python", "-m", "helios_jax.serve", "--host=0.0.0.0", "--port=8000"]
