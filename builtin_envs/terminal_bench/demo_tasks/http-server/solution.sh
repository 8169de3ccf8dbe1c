#!/bin/bash
mkdir -p /app/site
printf 'aenv-ray demo\n' > /app/site/index.html
cat > /app/serve.sh <<'SERVE'
#!/bin/bash
exec python3 -m http.server 8765 --bind 127.0.0.1 --directory /app/site
SERVE
