/* curl_epoll.h -- the sockets of a curl multi handle kept in an epoll set that
 * the loop watches as one descriptor (one uv_poll_t for all of them, not one
 * each). The LLM client and the SQS transport both drive curl this way; each
 * keeps its own loop handles and decides what runs after an event.
 * Not thread-safe: loop thread only. */
#ifndef CR_CURL_EPOLL_H
#define CR_CURL_EPOLL_H

#include <stdint.h>
#include <curl/curl.h>

/* The body of a CURLMOPT_SOCKETFUNCTION: adds, changes or removes fd in the
 * epoll set epfd as curl asks (what), and marks a socket added with owner
 * through curl_multi_assign() (socketp is curl's mark, NULL before). Returns 0,
 * or -1 when the set refuses the socket (curl then fails that transfer). */
int curl_epoll_socket(int epfd, CURLM *multi, curl_socket_t fd, int what, void *socketp,
                      void *owner);

/* The CURL_CSELECT_* flags for an epoll event mask: an error or hang-up is
 * both readable and writable, so that curl looks and finds out. */
int curl_epoll_flags(uint32_t events);

#endif
