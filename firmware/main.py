# Boot entry on the board (deployed as source): run the mqbatch application.
import mqb_app

mqb_app.main()
