#!/bin/bash
while pgrep -f 'midflight-lab bench' >/dev/null; do
  echo "$(date +%s) $(mysql -uroot -h127.0.0.1 -N -e "show global status like 'Threads_connected'" | cut -f2)"
  sleep 1
done
