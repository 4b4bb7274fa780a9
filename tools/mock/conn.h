/* SPDX-License-Identifier: MIT */
/*
 * conn.h - mock_upstream's HTTP side: a thread per accepted connection.
 */
#ifndef INFERGW_TOOLS_MOCK_CONN_H
#define INFERGW_TOOLS_MOCK_CONN_H

#include <pthread.h>

/*
 * Hand the accepted socket 'fd' (stolen: closed on every path) to a new
 * thread made with 'attr' (detached), which serves requests on it until
 * the client closes, asks to, goes idle or errs, and then frees its
 * connection.  A thread that cannot be made is logged and the socket
 * closed.
 */
void conn_spawn(int fd, const pthread_attr_t *attr);

#endif
