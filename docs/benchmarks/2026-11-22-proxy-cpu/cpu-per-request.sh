# A/B CPU per request: tailguard (and nginx with NGINX=1) under wrk, one worker pinned to core 0.
exe=${EXE:-/work/wt/lead/target/release/tailguard}
D=${D:-6}
taskset -c 1 $exe upstream --listen 127.0.0.1:19001 --threads 1 --body-bytes 13 >/tmp/up.log 2>&1 &
UP=$!
targets=""
if [ -n "$NGINX" ]; then taskset -c 0 nginx -c /tmp/ngx/nginx.conf -p /tmp/ngx -e /tmp/ngx/err.log & NG=$!; fi
RUST_LOG=warn taskset -c 0 $exe run --listen 127.0.0.1:19000 --threads 1 --upstream demo=127.0.0.1:19001 $EXTRA >/tmp/tg.log 2>&1 &
TG=$!
sleep 1.5
[ -n "$NGINX" ] && targets="ng:19002:$(pgrep -P $NG)"
targets="$targets tg:19000:$TG"
cpu() { awk '{print $14, $15}' /proc/$1/stat; }
for target in $targets; do
  IFS=: read name port pid <<<"$target"
  read u0 s0 < <(cpu $pid)
  n=$(taskset -c 1 wrk -t1 -c50 -d${D}s http://127.0.0.1:$port/ | awk '/requests in/{print $1}')
  read u1 s1 < <(cpu $pid)
  awk -v name=$name -v n=$n -v d=$D -v u=$((u1-u0)) -v s=$((s1-s0)) 'BEGIN{printf "%s req/s=%d user_us/req=%.2f sys_us/req=%.2f total=%.2f\n", name, n/d, u*1e4/n, s*1e4/n, (u+s)*1e4/n}'
done
kill $TG $UP $NG 2>/dev/null; wait 2>/dev/null
