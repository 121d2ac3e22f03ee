#!/bin/bash
cat > /app/greet.sh <<'SCRIPT'
#!/bin/sh
echo "Hello, ${1:-world}!"
SCRIPT
chmod +x /app/greet.sh
