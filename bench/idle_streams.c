/* idle_streams.c -- the memory floor: a bare libcurl multi client holding N idle
 * streaming POSTs.
 *
 *   build/bench/idle_streams URL N [SECONDS] [BUFFERSIZE]
 *
 * Starts N POSTs of a small chat body to URL (the fake server, told through
 * the model name to send headers and then stay silent), drives them with
 * curl_multi_poll for SECONDS (default 5) and reports the resident set before
 * and after, per transfer. BUFFERSIZE (optional) sets CURLOPT_BUFFERSIZE as
 * the worker does; 0 keeps libcurl's default. Prints one line:
 * "streams N open M rss_before_kb A rss_after_kb B per_stream_bytes C". */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static const char body[] =
    "{\"model\":\"fake/ttft_ms=600000,tokens=1\",\"messages\":[{\"role\":\"user\","
    "\"content\":\"hello\"}],\"stream\":true,\"stream_options\":{\"include_usage\":true}"
    "}";

static long rss_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, field, n))
            v = strtol(line + n, NULL, 10);
    fclose(f);
    return v;
}

static size_t on_data(char *p, size_t size, size_t nmemb, void *ud)
{
    long *bytes = ud;
    (void)p;
    *bytes += (long)(size * nmemb);
    return size * nmemb;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    struct rlimit rl;
    struct curl_slist *h = NULL;
    CURLM *multi;
    CURL **easy;
    long *got, before, after, open = 0;
    long bufsize = 0;
    int n, running;
    double secs = 5, t0;

    if (argc < 3) {
        fprintf(stderr, "usage: idle_streams URL N [SECONDS] [BUFFERSIZE]\n");
        return 2;
    }
    n = (int)strtol(argv[2], NULL, 10);
    if (argc > 3)
        secs = strtod(argv[3], NULL);
    if (argc > 4)
        bufsize = strtol(argv[4], NULL, 10);
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    multi = curl_multi_init();
    h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "Accept: text/event-stream");
    h = curl_slist_append(h, "Expect:");
    easy = calloc((size_t)n, sizeof(*easy));
    got = calloc((size_t)n, sizeof(*got));
    if (!multi || !h || !easy || !got)
        return 1;
    before = rss_kb("VmRSS:");
    for (int i = 0; i < n; i++) {
        easy[i] = curl_easy_init();
        curl_easy_setopt(easy[i], CURLOPT_URL, argv[1]);
        curl_easy_setopt(easy[i], CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(easy[i], CURLOPT_POSTFIELDSIZE, (long)sizeof(body) - 1);
        curl_easy_setopt(easy[i], CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(easy[i], CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(easy[i], CURLOPT_WRITEDATA, &got[i]);
        curl_easy_setopt(easy[i], CURLOPT_NOSIGNAL, 1L);
        if (bufsize > 0)
            curl_easy_setopt(easy[i], CURLOPT_BUFFERSIZE, bufsize);
        curl_multi_add_handle(multi, easy[i]);
    }
    t0 = now_s();
    do {
        curl_multi_perform(multi, &running);
        curl_multi_poll(multi, NULL, 0, 100, NULL);
    } while (running && now_s() - t0 < secs);
    after = rss_kb("VmRSS:");
    for (int i = 0; i < n; i++)
        open += got[i] > 0;
    printf(
        "streams %d open %ld rss_before_kb %ld rss_after_kb %ld per_stream_bytes %.0f\n",
        n, open, before, after, (double)(after - before) * 1024.0 / n);
    for (int i = 0; i < n; i++) {
        curl_multi_remove_handle(multi, easy[i]);
        curl_easy_cleanup(easy[i]);
    }
    curl_multi_cleanup(multi);
    curl_slist_free_all(h);
    curl_global_cleanup();
    free(easy);
    free(got);
    return 0;
}
