#!/bin/bash
mkdir -p /app/site
printf 'aenv-ray demo\n' > /app/site/index.html
nohup python3 -m http.server 8765 --bind 127.0.0.1 --directory /app/site > /tmp/http.log 2>&1 &
for _ in $(seq 50); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/')" 2>/dev/null && break
    sleep 0.1
done
