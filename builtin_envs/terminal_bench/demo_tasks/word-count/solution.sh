#!/bin/bash
cd /app
echo "the quick brown fox jumps over the lazy dog" | tr ' ' '\n' > words.txt
sort -u words.txt | wc -l | tr -d ' ' > count.txt
