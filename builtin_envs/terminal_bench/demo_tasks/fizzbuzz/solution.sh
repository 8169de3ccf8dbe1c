#!/bin/bash
cat > /app/fizzbuzz.py << 'EOL'
import sys


def line(i):
    if i % 15 == 0:
        return "FizzBuzz"
    if i % 3 == 0:
        return "Fizz"
    if i % 5 == 0:
        return "Buzz"
    return str(i)


for i in range(1, int(sys.argv[1]) + 1):
    print(line(i))
EOL
