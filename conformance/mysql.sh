# mysql_exec URL SQL: runs SQL on the MySQL/MariaDB server a mysql://USER[:PASSWORD]@HOST[:PORT]
# URL names and prints the rows, tab-separated, without headers. Sourced by the scripts that
# create or drop test databases on a MySQL server.
mysql_exec() {
    local rest=${1#mysql://} userinfo address host port=3306 user password=""
    userinfo=${rest%%@*}
    address=${rest#*@}
    address=${address%%/*}
    user=${userinfo%%:*}
    [[ $userinfo == *:* ]] && password=${userinfo#*:}
    host=$address
    if [[ $address == *:* ]]; then
        host=${address%:*}
        port=${address##*:}
    fi
    MYSQL_PWD=$password mariadb --protocol=tcp -h "$host" -P "$port" -u "$user" -Nse "$2"
}
