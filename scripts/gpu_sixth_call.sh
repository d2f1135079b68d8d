set -uo pipefail
. .gpu/setup.sh >/dev/null
start=$(date +%s)
F=results/attention/grid-h100.jsonl
G="--batch 8 --d 16,32,64,128 --seq 256,1024,4096,8192,16384 --dtype fp32,bf16 --output $F --resume --format json"
timeout 330 python3 -m profiler_kit attention bench --impl naive,flash-triton $G > /dev/null 2> /tmp/grid-a.err; tail -2 /tmp/grid-a.err
echo "[$(( $(date +%s) - start ))s] naive+flash"
left=$(( 560 - ($(date +%s) - start) ))
timeout $left python3 -m profiler_kit attention bench --impl compiled $G > /dev/null 2> /tmp/grid-b.err; tail -2 /tmp/grid-b.err
echo "[$(( $(date +%s) - start ))s] compiled"
cp $F "$OUT/"
