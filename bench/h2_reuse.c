/* h2_reuse.c -- a bare libcurl client that shows libcurl 7.88's HTTP/2 handle
 * reuse flaw (issue 18), with no celeriac code in the way.
 *
 *   build/bench/h2_reuse URL N ROUNDS REUSE [CAFILE]
 *
 * Sends N streamed chat POSTs to URL at once, over HTTP/2 with the worker's
 * settings (multiplexing, PIPEWAIT, 16 connections, 1,000 streams each, a
 * shared TLS session cache, a 1 KB receive buffer), waits for all of them,
 * and does it ROUNDS times on the same multi handle. REUSE 1 puts each
 * finished easy handle through curl_easy_reset() and uses it for a later
 * call, as the worker's pool did; REUSE 0 takes a new handle per call. Prints
 * one line per round: "round R done D ok K failed F in S s".
 *
 * Against scripts/tls_front.py in front of fake_fast (libcurl 7.88.1,
 * nghttp2 1.52.0), REUSE 1 with N = 3,000 or 10,000 died in its second round
 * every time it was tried: "corrupted double-linked list", or nghttp2's
 * assertion in find_stream_on_goaway_func(). REUSE 0 ran clean. */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static const char body[] =
    "{\"model\":\"fake/ttft_ms=380,tps=50,tokens=32\",\"messages\":[{\"role\":\"user\","
    "\"content\":\"hello\"}],\"stream\":true}";

static size_t on_data(char *p, size_t size, size_t nmemb, void *ud)
{
    (void)p;
    (void)ud;
    return size * nmemb;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void setup(CURL *e, const char *url, struct curl_slist *h, CURLSH *share,
                  const char *ca)
{
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)sizeof(body) - 1);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 1024L);
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
    curl_easy_setopt(e, CURLOPT_PIPEWAIT, 1L);
    curl_easy_setopt(e, CURLOPT_SHARE, share);
    if (ca)
        curl_easy_setopt(e, CURLOPT_CAINFO, ca);
}

int main(int argc, char **argv)
{
    struct rlimit rl;
    struct curl_slist *h = NULL;
    CURLM *multi;
    CURLSH *share;
    CURL **pool;
    CURLMsg *m;
    int n, rounds, reuse, npool = 0, running, left, done = 0, ok = 0, failed = 0;
    double t0;

    if (argc < 5) {
        fprintf(stderr, "usage: h2_reuse URL N ROUNDS REUSE [CAFILE]\n");
        return 2;
    }
    n = (int)strtol(argv[2], NULL, 10);
    rounds = (int)strtol(argv[3], NULL, 10);
    reuse = (int)strtol(argv[4], NULL, 10);
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    multi = curl_multi_init();
    share = curl_share_init();
    pool = calloc((size_t)n, sizeof(*pool));
    h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "Accept: text/event-stream");
    h = curl_slist_append(h, "Expect:");
    if (!multi || !share || !pool || !h)
        return 1;
    curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_multi_setopt(multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
    curl_multi_setopt(multi, CURLMOPT_MAX_CONCURRENT_STREAMS, 1000L);
    curl_multi_setopt(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, 16L);
    curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, 16L);
    t0 = now_s();
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < n; i++) {
            CURL *e = reuse && npool ? pool[--npool] : curl_easy_init();
            if (!e)
                return 1;
            setup(e, argv[1], h, share, argc > 5 ? argv[5] : NULL);
            curl_multi_add_handle(multi, e);
        }
        do {
            curl_multi_perform(multi, &running);
            while ((m = curl_multi_info_read(multi, &left))) {
                long code = 0;
                if (m->msg != CURLMSG_DONE)
                    continue;
                curl_easy_getinfo(m->easy_handle, CURLINFO_RESPONSE_CODE, &code);
                done++;
                if (m->data.result == CURLE_OK && code == 200)
                    ok++;
                else if (failed++ < 5)
                    fprintf(stderr, "failed: %s (HTTP %ld)\n",
                            curl_easy_strerror(m->data.result), code);
                curl_multi_remove_handle(multi, m->easy_handle);
                if (reuse) {
                    curl_easy_reset(m->easy_handle);
                    pool[npool++] = m->easy_handle;
                } else {
                    curl_easy_cleanup(m->easy_handle);
                }
            }
            if (running)
                curl_multi_poll(multi, NULL, 0, 100, NULL);
        } while (running);
        printf("round %d done %d ok %d failed %d in %.1f s\n", r, done, ok, failed,
               now_s() - t0);
        fflush(stdout);
    }
    while (npool)
        curl_easy_cleanup(pool[--npool]);
    curl_multi_cleanup(multi);
    curl_share_cleanup(share);
    curl_slist_free_all(h);
    curl_global_cleanup();
    free(pool);
    return 0;
}
