#!/bin/bash
# restart.sh [ARGS...]: restarts MariaDB with ARGS (none: its defaults) and waits until it answers
mysqladmin -uroot -h127.0.0.1 shutdown
for i in $(seq 1 100); do pgrep -x mariadbd >/dev/null || break; sleep 0.3; done
start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- "$@"
for i in $(seq 1 100); do mysql -uroot -h127.0.0.1 -N -e 'select @@thread_handling, @@thread_pool_size' 2>/dev/null && break; sleep 0.3; done
